"""Floor 2: sessions on disk — the log, its metadata, locking and store operations.

Where things are: :mod:`~memfs.store.session` (handles, ``open_session``, the registry),
:mod:`~memfs.store.writer` (the one commit path and the log file, durability and group
commit), :mod:`~memfs.store.recovery` (opening: fast path, rescan, torn tail),
:mod:`~memfs.store.metadata` (manifest and index persists; :mod:`~memfs.store.persister` is
the background thread), :mod:`~memfs.store.machine` (the turn state machine),
:mod:`~memfs.store.evict` (the cap), :mod:`~memfs.store.config` (durability and limits),
:mod:`~memfs.store.catalog` (listing and lookup of sessions), :mod:`~memfs.store.root` (a
store as a whole, for the mount).
"""
