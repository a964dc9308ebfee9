"""How the GKE emulator refuses a request: ``GkeError(code, message)``, raised by every rule (sim/gke_rules.py,
sim/gke_machines.py) and by the emulator itself, answered by sim/gke_transport.py as that gRPC status.

``code`` is the gRPC status name: google.api_core maps it to the same exception class as for real GKE
(INVALID_ARGUMENT -> BadRequest / InvalidArgument, ALREADY_EXISTS -> AlreadyExists (409 Conflict), NOT_FOUND ->
NotFound, FAILED_PRECONDITION -> FailedPrecondition). Messages are GKE's where a public source quotes them (cited
at each rule); otherwise written in GKE's style and marked "(wording ours)". Nothing but the standard library.
"""

from __future__ import annotations


class GkeError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def invalid_argument(message: str) -> GkeError:
    """The refusal of a request GKE finds malformed or inconsistent (HTTP 400)."""
    return GkeError("INVALID_ARGUMENT", message)
