"""Networking: NAT probing, QUIC on one UDP socket, hole punching, relay client, wire framing."""
