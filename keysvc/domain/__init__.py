"""The domain: keys, roles, permissions, activities, usage and webhooks as rules,
with no aiohttp and no SQL."""
