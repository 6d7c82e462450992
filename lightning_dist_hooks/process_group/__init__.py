"""The default process group's life on one rank, in the order it happens:

* ``create``: made through the module's ``setup_distributed_backend`` hook, with the rank's init method prepared
  before and finished at exit (``create_process_group``, ``DistributedSetupError``);
* ``progress``: while the rank waits for its peers, who is still missing, said every so often;
* ``rendezvous_deadline``: a rendezvous stuck inside torch past its timeout ends the rank, naming who is missing;
* ``lost_peers``: when a collective times out later, which ranks were lost, asked through the rendezvous store;
* ``exit_grace``: a finished rank hands the GIL to gloo's threads once more, so that it exits 0.

Only the strategy (``lightning_dist_hooks.strategy``) and the doctor use these; nothing here imports them.
"""
