"""``file://`` and ``dir://``: ranks meet through a filesystem they all share, and nobody listens.

What both schemes share, one concern per module:

* ``private_files``: the per-user private directory inside the shared one, and the owner, mode and link checks
  of everything opened there;
* ``launches``: the per-launch name a ``file:///DIR/`` URL gets, from the launcher's variables;
* ``claims``: how the ranks of one launch make or join one file, and refuse a file an earlier run left;
* ``janitor``: the helper process that removes a killed rank's files.

Then each scheme: ``file_scheme`` (the file is torch's ``FileStore`` log, checked by ``filestore_log``), and
``dir_scheme`` (the file points to a directory of entries, ``directory_store``'s lock-free store).
"""
