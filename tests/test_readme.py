"""The README's file-format examples are valid files: they cannot drift from planner/schema.py."""

import json
import re
from pathlib import Path

from hydraplan.schema import Plan, Profile, Strategies

MODELS = {"hydraplan.profile/v1": Profile, "hydraplan.strategies/v1": Strategies, "hydraplan.plan/v1": Plan}


def test_every_json_example_in_the_readme_validates():
    text = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    tags = [json.loads(b)["schema"] for b in blocks]
    assert sorted(tags) == sorted(MODELS)
    for block, tag in zip(blocks, tags, strict=True):
        MODELS[tag].model_validate_json(block)
