"""Who may call the GKE emulator: its service-account keys, the access tokens it issues (deterministic per
account: HMAC of the account with a secret kept in $SIM/gke/token-secret, so a refresh returns the same token),
the self-signed JWTs google-auth sends on gRPC, and the OAuth token endpoint named by the key file's
token_uri (JWT-bearer grant, RS256 assertion verified against the key's public key)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

from . import gke_dns
from .gke_settings import GKE_DIR, PKI, PROJECT, SA_EMAIL, TOKEN_PORT, TOKEN_SECONDS

log = logging.getLogger("gke")


def init_files():
    """The service-account key file (fresh RSA key) and the token secret, if missing."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    GKE_DIR.mkdir(parents=True, exist_ok=True)
    key_file = GKE_DIR / "service-account.json"
    token_uri = f"http://127.0.0.1:{TOKEN_PORT}/token"
    if key_file.exists():
        info = json.loads(key_file.read_text())
        if info.get("token_uri") != token_uri:  # the port changed: same key, new token endpoint
            info["token_uri"] = token_uri
            key_file.write_text(json.dumps(info, indent=2))
    else:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        info = {
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": uuid.uuid4().hex,
            "private_key": pem,
            "client_email": SA_EMAIL,
            "client_id": str(int(uuid.uuid4().int % 10**21)),
            "auth_uri": "http://127.0.0.1/unused",
            "token_uri": token_uri,
        }
        key_file.write_text(json.dumps(info, indent=2))
        key_file.chmod(0o600)
    gke_dns.ensure_public_ca(PKI)
    secret = GKE_DIR / "token-secret"
    if not secret.exists():
        secret.write_text(uuid.uuid4().hex + uuid.uuid4().hex)
        secret.chmod(0o600)
    return key_file


class Accounts:
    """The service accounts this emulator knows (every $SIM/gke/*service-account*.json) and their tokens."""

    def __init__(self):
        from cryptography.hazmat.primitives import serialization

        self.secret = (GKE_DIR / "token-secret").read_bytes()
        self.public_keys = {}  # client_email -> public key
        for path in sorted(GKE_DIR.glob("*service-account*.json")):
            info = json.loads(path.read_text())
            key = serialization.load_pem_private_key(info["private_key"].encode(), password=None)
            self.public_keys[info["client_email"]] = key.public_key()
        self.tokens = {self.token_for(email): email for email in self.public_keys}

    def token_for(self, email: str) -> str:
        mac = hmac.new(self.secret, email.encode(), hashlib.sha256).digest()
        return "ya29.sim-" + base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def grant(self, assertion: str) -> tuple[str, str]:
        """JWT-bearer grant: returns (access_token, email) or raises ValueError with the OAuth error text."""
        import jwt

        try:
            claims = jwt.decode(assertion, options={"verify_signature": False})
        except jwt.PyJWTError as e:
            raise ValueError(f"Invalid JWT: {e}") from None
        email = claims.get("iss")
        if email not in self.public_keys:
            raise ValueError("Invalid JWT Signature.")
        try:
            # google-auth puts Google's token endpoint in "aud" whatever the key's token_uri says.
            jwt.decode(
                assertion,
                self.public_keys[email],
                algorithms=["RS256"],
                leeway=60,
                audience=[f"http://127.0.0.1:{TOKEN_PORT}/token", "https://oauth2.googleapis.com/token"],
            )
        except jwt.PyJWTError as e:
            raise ValueError(f"Invalid JWT Signature. ({e})") from None
        return self.token_for(email), email

    def caller(self, bearer: str) -> str | None:
        """The service account a gRPC bearer token belongs to: an issued token or a self-signed JWT."""
        if bearer in self.tokens:
            return self.tokens[bearer]
        import jwt

        try:
            claims = jwt.decode(bearer, options={"verify_signature": False})
            email = claims.get("iss")
            if email in self.public_keys and claims.get("sub", email) == email:
                jwt.decode(
                    bearer, self.public_keys[email], algorithms=["RS256"], leeway=60, options={"verify_aud": False}
                )
                return email
        except jwt.PyJWTError:
            pass
        return None


def serve_tokens(accounts: Accounts):
    """The OAuth token endpoint (JWT-bearer grant) and GET /healthz, on TOKEN_PORT."""

    class Handler(BaseHTTPRequestHandler):
        def _json(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            if self.path == "/healthz":
                self._json(200, {"status": "ok"})
            else:
                self._json(404, {"error": "not_found"})

        def do_POST(self):  # noqa: N802
            if self.path != "/token":
                return self._json(404, {"error": "not_found"})
            form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
            if form.get("grant_type", [""])[0] != "urn:ietf:params:oauth:grant-type:jwt-bearer":
                return self._json(400, {"error": "unsupported_grant_type", "error_description": "Invalid grant_type."})
            try:
                token, email = accounts.grant(form.get("assertion", [""])[0])
            except ValueError as e:
                log.info("token refused: %s", e)
                return self._json(400, {"error": "invalid_grant", "error_description": str(e)})
            log.info("token issued to %s", email)
            self._json(200, {"access_token": token, "expires_in": TOKEN_SECONDS, "token_type": "Bearer"})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", TOKEN_PORT), Handler)
    threading.Thread(target=server.serve_forever, name="token", daemon=True).start()
    return server
