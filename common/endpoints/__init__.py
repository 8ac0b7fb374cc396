"""HTTP to OpenAI-compatible servers (vLLM): endpoints, retries, failover, bounded replies, secrets kept out."""
