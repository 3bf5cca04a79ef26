"""The HTTP server: FastAPI app factory and routes."""
