"""Swarm: the generic resources a GPU node advertises (resources), the cluster's nodes and tasks (cluster),
`ls --swarm` (ls), `swarm node-config` (nodeconfig, and its --check: nodecheck) and the command line of
`hostagent swarm` (args). Stacks are rendered by gpupin.hostagent.compose.stack."""
