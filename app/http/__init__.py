"""The HTTP core every API package shares (app/openai, app/anthropic, app/llamacpp): the error
type and its handlers, JSON bodies, field reads, generation parameters, SSE, the generating
resource, sessions, planning a generation, and the API-neutral chat pipeline. The API packages
import from here and never from each other; each keeps its own request and response shapes."""
