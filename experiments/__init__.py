"""specbound.experiments: the command line, validation runs, benchmarks, reports and plots."""
