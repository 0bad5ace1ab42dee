"""The doctor's checks: configuration, servers, network and TLS, this machine, a round trip, the local stack.

Private: the command is `telemetry_client.doctor.main`.
"""
