"""The gateway's HTTP surface: the Starlette app, the routes of each surface (SIE-native inference and generation,
OpenAI, the read surface, config, pools, dead letters, scaling, the status page and OpenAPI), content negotiation,
response headers, the one error-to-envelope mapping, auth and the drain. The only part of `sie.gateway` that imports
a web framework; every handler decodes, makes one domain call from the package above, and renders.
"""
