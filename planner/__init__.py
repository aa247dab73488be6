"""hydraplan's offline planner: length-aware heterogeneous strategies, dispatch and packing."""

__all__ = ["Planner"]


def __getattr__(name: str) -> object:
    """`planner.Planner` without importing numpy/pydantic on `import planner` (keeps the CLI start fast)."""
    if name == "Planner":
        from planner.iterate import Planner

        return Planner
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
