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
