"""What is to be benchmarked: models, systems, layouts and benchmark definitions (torch-free)."""
