"""The targeted mode's calibration: the sample, its factors and its share of zeros."""

import json

import numpy as np
import pytest
import torch
from _dynamiq_data import run_with_fresh_kernel_cache

from dynamiq.codecs import DynamiQ
from dynamiq.codecs.dynamiq.calibration import (
    CALIBRATION_ENERGY,
    CALIBRATION_ERRORS,
    CALIBRATION_SUPER_GROUPS,
    calibration,
    calibration_sums,
    zero_share,
)
from dynamiq.codecs.dynamiq.errors import measured_error


def test_calibration_sees_heavy_tails():
    g = torch.Generator().manual_seed(0)
    codec = DynamiQ(target=1e-3)
    gauss = torch.randn(1 << 16, generator=g)
    heavy = gauss * torch.rand(1 << 16, generator=g).pow(-0.6)  # Pareto-like magnitudes
    v = np.array([measured_error(q) for q in codec.quantizers])
    k = len(codec.options)

    def factors(x):
        sums = calibration_sums(x, codec.quantizers, 0)
        return calibration({name: t for name, (t, _) in sums.items()}, v, k)

    fg, fh = factors(gauss), factors(heavy)
    assert np.all((fg > 0.7) & (fg < 1.4))
    assert np.median(fh) > 1.3 * np.median(fg)
    assert np.all(calibration({}, v, k) == 1.0)
    bad = {CALIBRATION_ERRORS: torch.zeros(k + 1), CALIBRATION_ENERGY: torch.ones(1)}
    assert np.all(calibration(bad, v, k) == 1.0)


def test_zero_share_counts_the_sparse_support():
    """The calibration sample reports the share of exact zeros in its super-groups."""
    codec = DynamiQ(target=1e-3)
    g = torch.Generator().manual_seed(4)
    dense = torch.randn(64 * 256, generator=g)
    sparse = dense * (torch.rand(64 * 256, generator=g) < 0.25)
    share = {name: zero_share({CALIBRATION_ENERGY: calibration_sums(x, codec.quantizers, 0)[
        CALIBRATION_ENERGY][0]}) for name, x in (("dense", dense), ("sparse", sparse))}
    assert share["dense"] == 0.0
    assert share["sparse"] == pytest.approx(0.75, abs=0.02)
    assert zero_share({}) == 0.0


def test_calibration_sample_weighs_every_nonzero_super_group_alike():
    """The sample is spread along the energy order of the non-zero super-groups and each is
    scaled to unit energy: the energy sum counts them, zero super-groups are not sampled, and
    one huge super-group does not decide the factor."""
    codec = DynamiQ()
    g = torch.Generator().manual_seed(0)
    y = torch.randn(400 * 256, generator=g)
    y[: 100 * 256] = 0.0  # a quarter of the super-groups are zero
    sums = calibration_sums(y, codec.quantizers, 0)
    assert float(sums[CALIBRATION_ENERGY][0][0]) == pytest.approx(CALIBRATION_SUPER_GROUPS)
    y2 = y.clone()
    y2[-256:] *= 1e6  # the most energetic super-group, far above the rest
    sums2 = calibration_sums(y2, codec.quantizers, 0)
    ratio = sums2[CALIBRATION_ERRORS][0] / sums[CALIBRATION_ERRORS][0]
    assert torch.all((ratio > 0.9) & (ratio < 1.1))
    few = torch.zeros(300 * 256)
    few[:5 * 256] = torch.randn(5 * 256, generator=g)
    assert float(calibration_sums(few, codec.quantizers, 0)[CALIBRATION_ENERGY][0][0]) == \
        pytest.approx(5.0)


def test_the_sample_is_coded_on_the_calls_backend(tmp_path):
    """A targeted call codes its calibration sample with the kernels its hops use: simulated on
    the reference backend it writes nothing into a fresh kernel cache (a GPU call likewise
    compiles no CPU kernel), and the sums equal those of the Numba kernels bit for bit."""
    out, made = run_with_fresh_kernel_cache(
        tmp_path, "import json, torch, dynamiq\n"
        "x = torch.randn(4, 8192, generator=torch.Generator().manual_seed(0))\n"
        "r = dynamiq.simulate('dynamiq(target=1e-3)@ring', x, track_hops=False,\n"
        "                     backend='reference')\n"
        "print(json.dumps(r.vnmse))\n")
    assert made == []
    assert 0 < json.loads(out) < 1
    codec = DynamiQ(target=1e-3)
    x = torch.randn(1 << 15, generator=torch.Generator().manual_seed(1))
    ref = calibration_sums(x, codec.quantizers, 3, "reference")
    nb = calibration_sums(x, codec.quantizers, 3, "numba")
    assert ref.keys() == nb.keys()
    for name, (t, kind) in ref.items():
        assert kind == nb[name][1] and torch.equal(t, nb[name][0]), name
