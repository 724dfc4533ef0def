"""Root's and the host's primitives: link-safe files in the service user's folders, child
processes, a unit's state."""
