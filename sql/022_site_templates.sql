-- Each site's learned template (issue 43): the chrome its pages repeat (navigation, sidebars,
-- banners, footers), learned from the stored sources of its live pages in its discovery run, and
-- replaced whole each time it is learned again (one transaction). Not used by routing or chunking
-- yet: shown by `site show`, `site template` and the discovery asset's metadata.
CREATE TABLE site_templates (
    site             text PRIMARY KEY,
    learned_at       timestamptz,                       -- NULL: every learning so far failed
    pages            integer NOT NULL DEFAULT 0,        -- live pages with a source it was learned from
    short_words      smallint NOT NULL DEFAULT 12,
    texts            text[] NOT NULL DEFAULT '{}',      -- fingerprints of blocks template by their text
    shapes           text[] NOT NULL DEFAULT '{}',      -- of short blocks template by their shape
    sidebar_items    text[] NOT NULL DEFAULT '{}',      -- of the items of learned sidebars
    volatile_shapes  text[] NOT NULL DEFAULT '{}',      -- shapes seen with several texts
    pins             jsonb NOT NULL DEFAULT '[]',       -- the site YAML's template_pins it was learned with
    failed_at        timestamptz,                       -- the newest learning that failed (the template kept)
    error            text
);

CREATE TABLE site_template_blocks (
    site           text NOT NULL REFERENCES site_templates ON DELETE CASCADE,
    position       integer NOT NULL,                    -- most pages seen first
    kind           text NOT NULL,                       -- line, paragraph, list_item, link_list, volatile
    why            text NOT NULL CHECK (why IN ('text', 'shape', 'sidebar', 'pin')),
    fingerprint    text NOT NULL,
    pages_seen     integer NOT NULL,
    example_url    text NOT NULL,
    text           text NOT NULL,                       -- capped (core/template_rows.py TEXT_CAP)
    scope          text NOT NULL,                       -- site, or section <name>
    canonical_url  text,                                -- shared prose: the page where it stays content
    PRIMARY KEY (site, position)
);
