"""``benchmarks/served_teacher.py``'s loss comparison: at k = the vocabulary the top-k KL is the full KL, and a
coarser k never exceeds it."""

from __future__ import annotations

from benchmarks.served_teacher import main


def test_the_loss_comparison_reports_each_k_against_the_full_kl(tmp_path, tokenizer_path):
    results = main(["--loss-only", "--size", "tiny", "--gen-len", "8", "--tokenizer", str(tokenizer_path),
                    "--out", str(tmp_path / "loss.json")])["loss"]
    by_k = {row["k"]: row for row in results["by_k"]}
    assert sorted(by_k) == [20, 64, 6400] and results["targets"] > 0
    full = results["full_forward_kl"]
    assert abs(by_k[6400]["topk_forward_kl"] - full) < 1e-5 and abs(by_k[6400]["teacher_topk_mass"] - 1) < 1e-5
    assert by_k[20]["topk_forward_kl"] <= by_k[64]["topk_forward_kl"] + 1e-6 <= full + 2e-6
    assert (tmp_path / "loss.json").is_file()
