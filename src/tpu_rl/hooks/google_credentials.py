"""The credentials of the Google provider's async hooks, read off the triggerer's event loop."""

from __future__ import annotations

from typing import Any

from tpu_rl.hooks.in_thread import in_thread, run_to_the_end


async def warm_google_credentials(async_hook: Any) -> None:
    """Reads the credentials of a Google provider's async hook in a thread, where its sync hook keeps them: the
    provider reads them on the event loop when it makes a client or a token (``GKEAsyncHook._get_client``,
    ``_CredentialsToken.from_hook``), which loads a key file's RSA key (26 ms) or, with Application Default
    Credentials, may ask the metadata server: every trigger of the triggerer would wait. Reading them reads the
    connection, which may ask the triggerer's supervisor: never cut short (``in_thread``)."""
    sync_hook = await run_to_the_end(async_hook.get_sync_hook())
    await in_thread(sync_hook.get_credentials_and_project_id)
