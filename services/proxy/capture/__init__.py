"""Token-faithful capture: the per-(trial, thread) segment state machine and the
writer that makes every part durable in the capture store."""
