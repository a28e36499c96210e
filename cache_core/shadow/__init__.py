"""Shadow checks: labels without waiting for users (``checker``, ``equivalence``)."""
