"""Config: the knob schema, settings resolution, and the sources they are read from."""
