"""The monday scenario's replay lives in the product (claims.replay: the demo uses it); re-exported here."""

from claims.replay import CLUSTER, ClockedCluster, Played, play, replay

__all__ = ["CLUSTER", "ClockedCluster", "Played", "play", "replay"]
