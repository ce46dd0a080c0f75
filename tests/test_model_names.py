"""quantbench.model.names: the one fresh-name rule every rewrite uses."""

import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

from quantbench.model.names import UniqueNames, tensor_names, unique


def _model():
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    return helper.make_model(graph)


def test_unique_skips_taken_names_and_reserves_what_it_gives():
    taken = {"a", "a_1"}
    assert unique(taken, "a") == "a_2"
    assert unique(taken, "a") == "a_3"  # a_2 is now reserved
    assert unique(taken, "b") == "b"
    assert taken == {"a", "a_1", "a_2", "a_3", "b"}


def test_tensor_names_holds_tensors_and_nodes():
    assert tensor_names(_model()) == {"x", "y", "relu"}


def test_unique_names_avoids_a_graphs_tensors_and_nodes():
    names = UniqueNames(gs.import_onnx(_model()))
    given = [names.fresh("relu"), names.fresh("y"), names.fresh("relu")]
    assert given == ["relu_1", "y_1", "relu_2"]
