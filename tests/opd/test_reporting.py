"""The recipe's learning-curve chart: a PNG from a report, with bands over seeds or over problems."""

from __future__ import annotations

import pytest

from experiments.charts import write_curve_chart
from tests.helpers.charts import drawn_axes


def report(seeds: list[int]) -> dict:
    def point(step, accuracy, se_seeds):
        return {"step": step, "wall_s": 10.0 * step, "accuracy": accuracy, "se_seeds": se_seeds, "se_problems": 0.02}

    several = len(seeds) > 1
    return {"seeds": seeds, "heldout_problems": 500, "teacher": point(0, 0.9, None), "student": point(0, 0.1, None),
            "curves": {arm: [point(0, 0.1, 0.01 if several else None), point(40, top, 0.03 if several else None)]
                       for arm, top in (("opd_forward_kl", 0.6), ("kd_teacher_rollouts", 0.4))}}


@pytest.mark.parametrize("seeds", [[0], [0, 1, 2]])
def test_curve_chart_is_a_png_with_one_panel_per_axis(tmp_path, seeds):
    path, opened = drawn_axes(lambda: write_curve_chart(report(seeds), tmp_path / "charts" / "curves.png"))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (steps, walls), = opened
    assert steps.get_xlabel().startswith("student updates") and walls.get_xlabel().startswith("seconds of training")
    labels = [text.get_text() for text in steps.get_legend().get_texts()]
    assert labels == ["opd_forward_kl", "kd_teacher_rollouts", "teacher (0.900)", "student (0.100)"]
    bands = [collection for collection in steps.collections]
    assert len(bands) == 2  # one error band per arm
    top = bands[0].get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(0.6 + (0.03 if len(seeds) > 1 else 0.02))  # the band is ± 1 SE of that run
