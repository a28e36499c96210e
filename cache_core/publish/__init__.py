"""How the cache talks to Kafka: ``publisher`` sends events, entries and feedback (spilling
to ``spool`` while the brokers are away), ``event_worker`` finishes a lookup's event after
its answer has left, and ``control_topic`` reads and writes the control topic (experiment
configs): every instance's ``ControlListener`` follows it into the registry, the control
panel publishes through ``publish_confirmed``."""
