"""Protocol-agnostic chat core: canonical conversations, chat templates,
tokenizer, token-faithful rendering and tool-call parsing."""
