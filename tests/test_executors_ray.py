"""The Ray executor on a local 2-CPU Ray cluster: same results and failure rules as the others."""

from __future__ import annotations

from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'quantbench[ray]')")

from test_executors import always_fails, dies_once, fails_once, square_plus  # noqa: E402

from quantbench.collect.executors import ExecutorSpec, TaskFailed, run_tasks  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster():
    tests = str(Path(__file__).resolve().parent)  # the task functions live in test_executors
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        runtime_env={"env_vars": {"PYTHONPATH": tests}},
    )
    yield ExecutorSpec("ray", workers=2)
    ray.shutdown()


def test_results_in_item_order(ray_cluster: ExecutorSpec) -> None:
    got = run_tasks(ray_cluster, square_plus, list(range(7)), shared=10, show_progress=False)
    assert got == [10, 11, 14, 19, 26, 35, 46]


def test_transient_failure_and_dead_worker_are_retried(ray_cluster: ExecutorSpec, tmp_path) -> None:
    shared = str(tmp_path)
    assert run_tasks(ray_cluster, fails_once, [1, 2], shared=shared, show_progress=False) == [1, 2]
    got = run_tasks(ray_cluster, dies_once, [1, 2, 3], shared=shared, show_progress=False)
    assert got == [1, 2, 3]


def test_failing_twice_is_one_line_naming_the_item(ray_cluster: ExecutorSpec) -> None:
    with pytest.raises(TaskFailed, match=r"^shard 5 failed twice: RuntimeError: boom 5$"):
        run_tasks(
            ray_cluster, always_fails, [5], describe=lambda i: f"shard {i}", show_progress=False
        )


def test_sharded_calibration_on_ray_is_byte_identical(ray_cluster: ExecutorSpec, tmp_path) -> None:
    """Shards as Ray tasks (model bytes in the object store): the local run's cache bytes."""
    import numpy as np
    import synthetic

    from quantbench.calibrate import calibrate

    model = synthetic.save(synthetic.small_cnn(), tmp_path / "cnn.onnx")
    np.savez(tmp_path / "calib.npz", input=synthetic.images(30, seed=4))
    out = {}
    for name, spec in (("local", None), ("ray", ray_cluster)):
        result = calibrate(
            model,
            tmp_path / "calib.npz",
            methods=["entropy", "mse"],
            output=tmp_path / name,
            use_cache=False,
            show_progress=False,
            batch_size=4,
            executor=spec,
        )
        out[name] = ({p.name: p.read_bytes() for p in (tmp_path / name).iterdir()}, result.stats)
    assert out["ray"][0] == out["local"][0] and len(out["local"][0]) == 2
    assert out["ray"][1].data_fingerprint == out["local"][1].data_fingerprint
    assert out["ray"][1].num_samples == 30


def test_sensitivity_on_ray_ranks_as_the_local_run(ray_cluster: ExecutorSpec, tmp_path) -> None:
    import numpy as np
    import synthetic
    from test_recover import heavy_tailed_cnn

    from quantbench.recovery import sensitivity

    model = synthetic.save(heavy_tailed_cnn(), tmp_path / "heavy.onnx")
    np.savez(tmp_path / "calib.npz", input=synthetic.images(16, seed=1))
    np.savez(tmp_path / "eval.npz", input=synthetic.images(16, seed=2))
    args = (model, tmp_path / "calib.npz", tmp_path / "eval.npz")
    local = sensitivity(*args, batch_size=8)
    on_ray = sensitivity(*args, batch_size=8, executor=ray_cluster)

    def strip(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    assert strip(on_ray) == strip(local)
