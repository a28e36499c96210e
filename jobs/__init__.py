"""PyFlink jobs: wiring only (sources, windows, sinks from Settings); logic lives in udfs/."""
