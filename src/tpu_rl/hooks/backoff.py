"""How the hooks make a request again after an answer its service documents as one to retry (a 429, a 5xx, a
dropped connection): Kubernetes (client-go ``rest/with_retry.go``) and Cloud Storage ("Retry strategy"). GKE's
calls take the google-api-core retry the Google provider's hooks take (``hooks.gke.call_retry``)."""

from __future__ import annotations

import random

#: How many times a request is made at most.
REQUEST_ATTEMPTS = 5


def backoff_seconds(attempt: int) -> float:
    """The wait after the ``attempt``-th failed try (1-based): 1, 2, 4, 8 s, at most 16 s, each less up to a half
    at random, so that many waits failed together do not ask again together (Cloud Storage's "exponential
    backoff with jitter")."""
    return min(16.0, 2.0 ** (attempt - 1)) * random.uniform(0.5, 1.0)
