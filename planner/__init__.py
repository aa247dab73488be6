"""hydraplan's offline planner: length-aware heterogeneous strategies, dispatch and packing."""

__all__ = ["Planner"]


def __getattr__(name: str) -> object:
    """`hydraplan.Planner` without importing numpy/pydantic on `import hydraplan` (keeps the CLI start fast)."""
    if name == "Planner":
        from hydraplan.engine.planner import Planner

        return Planner
    raise AttributeError(f"module 'hydraplan' has no attribute {name!r}")
