"""How requests reach the endpoints: the chat client, the pool of endpoints, in-flight limits, vLLM's metrics."""
