"""The cache's state beyond one process: durable on disk (``persistence``: log and
snapshots), shared with the other replicas (``replication``: the entries topic), and
changed by users' verdicts (``feedback``: the feedback topic). ``follower`` reads a
topic from the start; ``codec`` writes an entry and its vector down for all of them.
"""
