"""Accounts' credentials and roles on API calls (see ``authorizer``)."""
from .authorizer import Authorizer, Principal, allowed, parse_bearer

__all__ = ["Authorizer", "Principal", "allowed", "parse_bearer"]
