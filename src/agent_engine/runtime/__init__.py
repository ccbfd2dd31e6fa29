"""One run's agent loop: compose the prompt, offer the tools, talk to the model until it answers."""
