"""Pure attribution functions (no I/O, no Flink); Flink wrappers live in udfs.flink."""
