"""A reduction or permute whose result reaches a matrix product through a
view (densenet121's and googlenet's classifier heads: mean(keepdim) ->
flatten -> linear) compiles: the GEMM reads the stored [1, c, 1, 1] as
[1, c]. Before the fix, kiln.compile raised 'gemm a tensor ... has 1024
elements (last dim 1), expected [1, 1024]'."""

import pytest
import torch

import kiln
from _helpers import export

pytestmark = pytest.mark.needs_compiler


class MeanFlattenLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(x).mean(dim=(2, 3), keepdim=True), 1))


class PermuteReshapeLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(24, 5)

    def forward(self, x):  # [2, 6, 4] -> [2, 4, 6] (a layout kernel) -> [2, 24]
        return self.fc(x.permute(0, 2, 1).reshape(2, 24))


@pytest.mark.parametrize("model,shape", [(MeanFlattenLinear, (1, 64, 8, 8)), (PermuteReshapeLinear, (2, 6, 4))])
def test_view_of_a_kernel_result_feeds_a_gemm(model, shape):
    x = torch.randn(*shape)
    compiled = kiln.compile(export(model().eval(), x), arg_inputs=(x,))
    assert compiled.delegates == ["KilnBackend"]
    assert compiled.summary.ops_on_cpu == {}


class BatchedMatrixVector(torch.nn.Module):
    """A bmm whose b is one column a batch, viewed from a kernel result stored
    with other trailing dims (Mixtral's batched_mm experts: [16, 2, 128] read
    as [32, 128, 1]). Before the fix the engine check refused it ('does not
    split into rows of 1 elements') and the bmm ran on the CPU."""

    def forward(self, w, x):
        return torch.bmm(w, (x * 2.0).reshape(32, 128, 1))


def test_batched_matrix_vector_of_a_viewed_result_compiles():
    w, x = torch.randn(32, 64, 128), torch.randn(16, 2, 128)
    compiled = kiln.compile(export(BatchedMatrixVector().eval(), w, x), arg_inputs=(w, x))
    assert compiled.delegates == ["KilnBackend"]
    assert compiled.summary.ops_on_cpu == {}
