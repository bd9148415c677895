"""The monday scenario's replay lives in the simulator app (the demo uses it); re-exported here."""

from simulator.replay import CLUSTER, ClockedCluster, Played, play, replay

__all__ = ["CLUSTER", "ClockedCluster", "Played", "play", "replay"]
