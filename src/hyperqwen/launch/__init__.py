"""Launch: settings -> memory budget -> vLLM command line -> exec."""
