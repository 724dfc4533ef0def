"""The warmup: prompts, batch sizes, chat, first-versus-steady measurement."""
