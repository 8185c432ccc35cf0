"""Swarm: the cluster's nodes, tasks and generic resources (cluster), `ls --swarm` (ls) and `swarm node-config`
(nodeconfig). Stacks are rendered by gpupin.hostagent.compose.stack."""
