"""A partition: one candidate per table and the ranks its pieces landed on."""

from dataclasses import dataclass

import numpy as np

from planner.candidates import Candidate


@dataclass
class TableChoice:
    cand: Candidate
    ranks: list[np.ndarray]  # per group, the rank of each piece


@dataclass
class Assignment:
    choices: list[TableChoice]  # indexed by table
    solver: str
    status: str
    notes: list[str]
