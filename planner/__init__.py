"""hydraplan's offline planner: length-aware heterogeneous strategies, dispatch and packing."""
