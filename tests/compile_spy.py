"""A torch.compile backend for tests that records which addnorm operators reach the forward and backward graphs
AOTAutograd hands it, and runs those graphs as they are."""

from __future__ import annotations


def addnorm_ops_backend(seen: set):
    """The backend; every ``addnorm.*`` call target it sees is added to ``seen``."""
    from torch._functorch.aot_autograd import aot_module_simplified

    def keep(gr, _):
        seen.update(str(n.target) for n in gr.graph.nodes
                    if n.op == "call_function" and str(n.target).startswith("addnorm."))
        return gr

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    return backend
