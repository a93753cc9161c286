"""The config service's HTTP surface: the Starlette app and its routes under `/v1/configs` plus the probes, and the
one mapping from the service's exceptions to HTTP answers. The only part of `sie.control` that imports a web
framework; each handler checks access, decodes, makes one domain call and encodes.
"""
