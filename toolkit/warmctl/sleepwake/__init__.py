"""Sleep, wake and drain of an instance, and the proxy gate's one model."""
