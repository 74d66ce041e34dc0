"""agentic_esopt: evolution strategies for fine-tuning LLM agents, in JAX."""
