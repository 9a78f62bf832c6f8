"""The ablation of ``dynamiq bench nmse --ablation``: the paper's steps, then this library's.

Each step is a pipeline spec at 5 bits/coordinate that adds one ingredient to the one before;
the steps before the last ones pin the paper's coding of levels and scales, so each row
measures one change.
"""

from __future__ import annotations

__all__ = ["ABLATION", "ABLATION_SIDE"]

#: The paper's ablation, each step adding one ingredient, all at 5 bits/coordinate (a
#: fixed 4-bit width with a BF16 scale per group of 16 costs exactly 5), then the steps by which
#: the default goes beyond the paper. In a ring, correlated rounding cannot lower the error of an
#: unbiased pipeline (each coordinate is rounded once per tree height, and roundings along one
#: path are uncorrelated martingale steps): that step is expected to be neutral there and to help
#: only on trees with several nodes per height holding similar values.
_PAPER_META = "dither=false,metadata=bf16,per_hop=false"
#: The paper's coding of the levels and scales, kept until the ablation's last steps change it.
_PAPER_CODE = "midrise=false,super_scale=bf16,scale_rounding=stochastic"
_FLAT = "scales=flat,rounding=stochastic,group_size=16,midrise=false"
_DITHER4 = f"{_PAPER_CODE},dither_min_width=4"
ABLATION: tuple[tuple[str, str], ...] = (
    ("uniform levels", f"dynamiq(widths=4,levels=uniform,{_FLAT},dither=false)"),
    ("ε-levels", f"dynamiq(widths=4,{_FLAT},dither=false)"),
    ("+ variable widths (+ centering)",
     f"center(statistic=sum)+dynamiq({_FLAT},{_PAPER_META})"),
    ("+ hierarchical scales",
     f"center(statistic=sum)+dynamiq(rounding=stochastic,group_size=16,{_PAPER_META},"
     f"{_PAPER_CODE})"),
    ("+ correlated rounding",
     f"center(statistic=sum)+dynamiq(group_size=16,{_PAPER_META},{_PAPER_CODE})"),
    ("+ groups of 32",
     f"center(statistic=sum)+dynamiq(group_size=32,{_PAPER_META},{_PAPER_CODE})"),
    ("+ dithered decoding",
     f"center(statistic=sum)+dynamiq(group_size=32,metadata=bf16,per_hop=false,{_DITHER4})"),
    ("+ 8-bit metadata", f"center+dynamiq(group_size=32,per_hop=false,{_DITHER4})"),
    ("+ groups of 32 or 64", f"center+dynamiq(per_hop=false,{_DITHER4})"),
    ("+ widths per hop", f"center+dynamiq({_DITHER4})"),
    ("+ mid-rise levels",
     "center+dynamiq(super_scale=bf16,scale_rounding=stochastic,dither_min_width=4)"),
    ("+ power-of-two super scales, scales rounded up", "center+dynamiq(dither_min_width=4)"),
    ("+ width 3 dithered (default)", "center+dynamiq"),
)

#: Variants shown beside the ablation, not steps of it: the paper's path-correlated rounding
#: (biased; its bias shows with ``--bias``) in place of the default's per-height correlation.
ABLATION_SIDE: tuple[tuple[str, str], ...] = (
    ("(side) path-correlated rounding",
     f"center(statistic=sum)+dynamiq(group_size=16,rounding=path,{_PAPER_META},"
     f"{_PAPER_CODE})"),
)
