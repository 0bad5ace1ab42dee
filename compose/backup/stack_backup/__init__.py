"""Off-host, encrypted backups of the stack's stores with restic.

One module per job: `config` reads and checks the settings file the Ansible
backup role renders, `lock` keeps two runs apart, `space` refuses a staging copy
the disk cannot hold, `stores` stages each store by its own consistent method,
`restic` drives the repository, `state` keeps the last outcome and reports it as
the `stack_backup` metric, `run` puts a backup run together, and `__main__` is
the command line (`python3 -m stack_backup run|report|restore|check-config`).

Standard library only: it runs on every stateful host with the system's Python.
"""
