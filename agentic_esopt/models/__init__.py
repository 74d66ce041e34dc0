"""Decoder-only LLMs as pure functions of a params pytree, with population-aware inference."""

from agentic_esopt.models import lora
from agentic_esopt.models.config import ModelConfig
from agentic_esopt.models.decoder import init_params
from agentic_esopt.models.export import save_adapter, save_pretrained
from agentic_esopt.models.kv_cache import Conversation, ConversationCache
from agentic_esopt.models.loading import Model, load
from agentic_esopt.models.sampling import GenerationOutput, Sampling, generate, logits

__all__ = ["Conversation", "ConversationCache", "GenerationOutput", "Model", "ModelConfig",
           "Sampling", "generate", "init_params", "load", "logits", "lora", "save_adapter",
           "save_pretrained"]
