"""KVCM: a KVCache metadata manager for LLM inference (Tair KVCache Manager protocol)."""
