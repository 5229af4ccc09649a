"""The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) on the
shared chat pipeline: protocol.py parses a request into the chat route's internal request,
serving.py reads the same ChoicePipeline, shapes.py says it Anthropic's way, errors.py gives
these routes Anthropic's error envelope."""
