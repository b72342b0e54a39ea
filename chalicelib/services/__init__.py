"""The API's handlers, one module per upstream service: ``meta`` (MetaService), ``admin``
(AdminService), ``debug`` (DebugService); ``cluster`` the cluster methods of both (leader
discovery over the background lease); ``health`` what checkHealth says of storages and groups.

A handler is a method of a small class built once per container by the composition root
(``runtime``) with the few collaborators it uses; ``routes`` declares which method
serves which API name. Handlers take a parsed request model and return a response model;
errors are raised typed and become wire codes in ``routes.dispatch`` only.
"""
