"""The wire contract: enums, pydantic models, proto3-JSON parsing and rendering, error codes."""
