"""A federated round: who takes part (client_sampling, stragglers: drawn from each node's own
stream) and what the coordinator, a node and the channel say to each other (protocol). Above the
algorithms, whose declared tensors and events the messages carry."""
