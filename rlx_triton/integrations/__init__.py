"""Integrations with model libraries: transformers attention backend, pyannote.audio model optimizer."""
