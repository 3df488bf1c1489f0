-- The chat of `make pg-demo` (scripts/pg-demo.sh), in the shape the demo page
-- reads: rooms, each user's memberships (a foreign key to rooms, followed as
-- Ordo's `ref` field `room`) and messages. Times are milliseconds since the
-- Unix epoch (int8), as the page shows them.

CREATE FUNCTION now_ms() RETURNS int8 LANGUAGE sql AS
  $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 $$;

CREATE TABLE rooms (
  id text PRIMARY KEY,
  name text NOT NULL,
  recency int8 NOT NULL DEFAULT now_ms(),
  last_seq int8 NOT NULL DEFAULT 0,
  preview text NOT NULL DEFAULT '',
  dm bool NOT NULL DEFAULT false
);

-- One row per (user, room); the id is `user:room`, as the page expects.
CREATE TABLE members (
  id text PRIMARY KEY,
  owner text NOT NULL,
  room text NOT NULL REFERENCES rooms ON DELETE CASCADE,
  read_upto int8 NOT NULL DEFAULT 0,
  favourite bool NOT NULL DEFAULT false,
  UNIQUE (owner, room)
);

CREATE TABLE messages (
  id text PRIMARY KEY,
  room text NOT NULL REFERENCES rooms ON DELETE CASCADE,
  seq int8 NOT NULL,
  author text NOT NULL,
  text text NOT NULL,
  time int8 NOT NULL
);

-- What the app's backend does on a new message, in the same transaction: the
-- message takes its room's next number, the room moves (recency, preview) and
-- the author has read up to it. `INSERT INTO messages (room, author, text)`
-- is then all a writer needs.
CREATE FUNCTION post_message() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.time := now_ms();
  UPDATE rooms SET last_seq = last_seq + 1, recency = NEW.time, preview = NEW.author || ': ' || NEW.text
    WHERE id = NEW.room RETURNING last_seq INTO NEW.seq;
  IF NEW.seq IS NULL THEN
    RAISE EXCEPTION 'no room %', NEW.room;
  END IF;
  NEW.id := NEW.room || '#' || lpad(NEW.seq::text, 8, '0');
  UPDATE members SET read_upto = NEW.seq WHERE owner = NEW.author AND room = NEW.room;
  RETURN NEW;
END $$;
CREATE TRIGGER post_message BEFORE INSERT ON messages FOR EACH ROW EXECUTE FUNCTION post_message();

INSERT INTO rooms (id, name, dm) VALUES
  ('everyone', 'Everyone', false),
  ('hike', 'Weekend hike', false),
  ('release', 'Release crew', false),
  ('books', 'Book club', false),
  ('cafe', 'Café Zürich', false),
  ('tokyo', '東京 meetup', false),
  ('omega', 'Ωmega team', false),
  ('dm-alice-bob', 'alice & bob', true),
  ('dm-alice-carol', 'alice & carol', true),
  ('dm-bob-dave', 'bob & dave', true);

INSERT INTO members (id, owner, room)
SELECT owner || ':' || room, owner, room FROM (VALUES
  ('everyone', ARRAY['alice', 'bob', 'carol', 'dave', 'erin', 'frank', 'grace', 'heidi']),
  ('hike', ARRAY['alice', 'bob', 'carol']),
  ('release', ARRAY['alice', 'bob', 'dave', 'erin']),
  ('books', ARRAY['bob', 'dave', 'frank']),
  ('cafe', ARRAY['alice', 'carol', 'erin', 'grace']),
  ('tokyo', ARRAY['carol', 'frank', 'grace', 'heidi']),
  ('omega', ARRAY['alice', 'dave', 'heidi']),
  ('dm-alice-bob', ARRAY['alice', 'bob']),
  ('dm-alice-carol', ARRAY['alice', 'carol']),
  ('dm-bob-dave', ARRAY['bob', 'dave'])
) AS rooms_members(room, owners), unnest(owners) AS owner;

-- A first message in each room from each of its members but alice.
INSERT INTO messages (room, author, text)
SELECT room, owner, 'hello ' || room FROM members WHERE owner <> 'alice' ORDER BY room, owner;

-- The tables Ordo follows; each has a primary key (REPLICA IDENTITY DEFAULT).
CREATE PUBLICATION ordo_chat FOR TABLE rooms, members, messages;
